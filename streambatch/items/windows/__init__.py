"""Windows: fixed-length spans of one document, and their gathers."""
