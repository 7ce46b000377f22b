"""The FeatureRunner: its BentoML service (``service``) and its BentoML-free core (sampling,
neighbourhoods, the feature cache, the graph snapshot)."""
