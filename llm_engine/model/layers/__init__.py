"""Building blocks of the decoder models; their hot ops go through llm_engine.model.ops."""
