"""Columnar inputs: Parquet, Arrow IPC and Hugging Face datasets, read by record batch (``tables``)."""
