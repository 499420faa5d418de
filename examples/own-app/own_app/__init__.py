"""own-app: a Flower app with its own model and data that runs stamen's methods."""
