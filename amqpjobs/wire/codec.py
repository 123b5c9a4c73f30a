"""Deprecated name of :mod:`amqpjobs.wire.lenient_decoding` (it decodes frames leniently; it encodes nothing).

Kept so that old imports work; import from :mod:`amqpjobs.wire.lenient_decoding`.
"""

from __future__ import annotations

from amqpjobs.wire.lenient_decoding import install_lenient_decoding

__all__ = ["install_lenient_decoding"]
