"""Rules about alerts: where a spec's notify section would send them.

Alerts go only to the format's official API, a Mattermost webhook, or a URL the operator allows
outside the spec (``$MXC_NOTIFY_ALLOWED_URLS``, mxc/node/notify_policy.py). That setting is
the one thing here read from the environment of ``mxc check``: it belongs to the machine that
sends the alerts, never to the spec.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from mxc.compiler.check.subject import Issue, Subject
from mxc.node import notify_policy

_DEFAULT_API = "https://api.telegram.org"


def notify_destination(s: Subject) -> Iterator[Issue]:
    """notify.api_url is an allowed destination: the official Telegram API, or a URL the operator lists
    in $MXC_NOTIFY_ALLOWED_URLS outside the spec (alerts are never sent anywhere else, so a spec naming
    another host would only fail at run time); for slack and mattermost it is unused (warning)."""
    notify = s.spec.notify
    if notify is None:
        return
    setting = os.environ.get(notify_policy.ALLOWED_URLS_ENV)
    try:
        notify_policy.operator_bases(setting)
    except ValueError as exc:
        yield Issue(("notify",), str(exc), "fix the operator setting (docs/alerts.md)")
        return
    if notify.format != "telegram":
        if notify.api_url.rstrip("/") != _DEFAULT_API:
            yield Issue(("notify", "api_url"), f"notify.api_url is used by the telegram format only; {notify.format} "
                        "alerts go to the webhook URL held in the secret", "remove notify.api_url", severity="warning")
        return
    problem = notify_policy.api_url_problem(notify.api_url, setting)
    if problem:
        yield Issue(("notify", "api_url"), problem + ": alerts would not be sent",
                    f"use {_DEFAULT_API}, or have the operator set {notify_policy.ALLOWED_URLS_ENV} (docs/alerts.md)")
