"""message-app: Flower's PyTorch app shape on the Message API, running a stamen strategy."""
