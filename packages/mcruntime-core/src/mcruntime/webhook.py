"""The webhook machinery, for code that builds or serves webhooks beyond the builder's defaults.

A program registers webhooks with :func:`mcruntime.webhook_managed_by` and
configures the port with :class:`mcruntime.WebhookOptions`; these name the
parts underneath: the HTTPS server the manager runs, the builder and the
registry it fills, and the shapes of the functions a webhook calls (a
validator, a defaulter, a conversion) and what happens when one fails. Kept
out of ``mcruntime``'s root so the root stays the runtime a program wires
together.
"""

from __future__ import annotations

from ._manager.webhooks import WebhookBuilder, Webhooks
from ._webhook.handlers import ConversionFunction, Defaulter, OnError, Validator
from ._webhook.server import WebhookServer

__all__ = [
    "ConversionFunction",
    "Defaulter",
    "OnError",
    "Validator",
    "WebhookBuilder",
    "WebhookServer",
    "Webhooks",
]
