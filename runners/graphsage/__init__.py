"""The GraphSAGERunner: its BentoML service (``service``) and its BentoML-free core (model
artifacts, backends, batched inference)."""
