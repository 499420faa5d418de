"""stamen's ClientApp, with the throwaway model registered first."""

import tiny.model  # noqa: F401  (registers tiny-net)
from app.client_app import app

__all__ = ["app"]
