"""Local accounts for the embedded default and small deployments.

NativeAuthenticator (maintained by the JupyterHub community) keeps the accounts: sign-up,
bcrypt-hashed passwords, admin approval, password changes. Its own /login handler times
sign-ins with the statsd client JupyterHub 6 removed, so it fails there; JupyterHub's own
login page calls the same `authenticate()`, and is what this subclass leaves in place.
"""

from __future__ import annotations

from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler


class MeterNativeAuthenticator(NativeAuthenticator):
    def get_handlers(self, app):
        return [
            (path, handler)
            for path, handler in super().get_handlers(app)
            if handler is not NativeLoginHandler
        ]
