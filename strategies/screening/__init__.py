"""What a reply must pass before it may touch the global model: the checks, the reply and update-norm screens."""
