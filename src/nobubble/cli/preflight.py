"""Re-exported for ``pp plan``: :func:`nobubble.rl.preflight.load_user_object`."""

from nobubble.rl.preflight import load_user_object

__all__ = ["load_user_object"]
