"""attnkit inside other libraries, each imported only on demand.

- :mod:`attnkit.integrations.transformers`: ``attn_implementation="attnkit"`` for
  Hugging Face transformers models (attnkit's ``transformers`` extra).

Importing :mod:`attnkit` imports none of them, nor the libraries they serve.
"""
