"""Retrieval indexes: BM25 over the project tokenizer, dense vectors in FAISS, and their fusion."""
