"""What the three services share: settings, the wire contracts, internal calls, batching,
breakers, metrics helpers, and (``common.bento``) the one adapter to BentoML's internals."""
