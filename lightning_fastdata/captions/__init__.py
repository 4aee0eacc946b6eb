"""Image-text pairs: the caption target room (captions from tar members, JSON fields and Parquet text columns)."""
