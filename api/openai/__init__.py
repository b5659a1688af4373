"""OpenAI's embeddings, models and files, in OpenAI's schema."""
