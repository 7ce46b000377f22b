"""The BentoML adapter: every use of BentoML internals lives in this package."""
