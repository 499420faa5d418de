"""How replies become a model: the weighted mean and the robust rules (median, trimmed mean, Krum, multi-Krum)."""
