"""The methods' server sides that have hooks of their own, and diffusion's graphs, combinations and topology."""
