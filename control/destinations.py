"""Where a webhook may point: the URL rules and the address policy (SSRF guard).

Webhook URLs are set by admins, but the service calls them from inside the network, so a
URL must not turn liftgate into a way to reach what it can reach and the admin cannot:

- ``http`` or ``https`` only, a host, no user:password part, at most 2,048 characters;
- never an address no receiver lives on: link-local (``169.254.0.0/16`` — the cloud metadata
  service at ``169.254.169.254`` among them — and ``fe80::/10``), multicast, unspecified
  (``0.0.0.0``, ``::``), reserved ranges, and the IPv6 forms that embed one (mapped, 6to4);
  ``allow_link_local`` lifts the link-local refusal for a deployment that needs it;
- loopback and private ranges (``10/8``, ``172.16/12``, ``192.168/16``, ``fc00::/7``) are
  allowed by default — receivers next to liftgate (a chat bridge, an incident tool) live
  there — and refused with ``deny_private``.

The rules apply to every address the host resolves to, when the URL is added (a literal IP)
and again at every delivery (names: the sender's resolver refuses a forbidden address, so a
name that later resolves elsewhere — DNS rebinding — is refused at connection time).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

MAX_URL: Final = 2048
_METADATA_V6: Final = ipaddress.ip_address("fd00:ec2::254")


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    allow_link_local: bool = False
    deny_private: bool = False

    def refusal(self, address: str) -> str | None:
        """Why a connection to ``address`` is refused, or None."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{address!r} is not an IP address"
        if isinstance(ip, ipaddress.IPv6Address):
            embedded = ip.ipv4_mapped or ip.sixtofour
            if embedded is not None:
                return self.refusal(str(embedded))
            if ip == _METADATA_V6:
                return f"{ip} is a cloud metadata address"
        if ip.is_link_local and not self.allow_link_local:
            return f"{ip} is link-local (cloud metadata lives there); set LIFTGATE_NOTIFY_ALLOW_LINK_LOCAL to allow"
        if ip.is_multicast or ip.is_unspecified:
            return f"{ip} is not a unicast address"
        if ip.is_loopback or ip.is_private:
            if self.deny_private:
                return f"{ip} is a loopback or private address (LIFTGATE_NOTIFY_DENY_PRIVATE is set)"
            return None
        if ip.is_reserved:
            return f"{ip} is a reserved address"
        return None


def url_problem(url: str, policy: AddressPolicy) -> str | None:
    """Why ``url`` cannot be a webhook, or None (a literal IP host is checked here too)."""
    if len(url) > MAX_URL:
        return f"url is longer than {MAX_URL} characters"
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        return "url must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"url is not valid: {exc}"
    if parts.scheme not in ("http", "https"):
        return "url must start with http:// or https://"
    if not parts.hostname:
        return "url has no host"
    if parts.username is not None or parts.password is not None:
        return "url must not carry a user or password (use --secret to sign instead)"
    if port == 0:
        return "url has port 0"
    host = parts.hostname
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None  # a name: checked at each delivery, on every address it resolves to
    refusal = policy.refusal(host)
    return None if refusal is None else f"url host refused: {refusal}"


def preview(url: str) -> str:
    """What the API and logs show of a URL: scheme and host (a path can hold a credential, as
    Slack's incoming-webhook URLs do)."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
    except ValueError:
        return "***"
    return (
        f"{parts.scheme}://{netloc}/***"
        if parts.path not in ("", "/") or parts.query
        else f"{parts.scheme}://{netloc}/"
    )
