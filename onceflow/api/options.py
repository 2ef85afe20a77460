"""What the operator API reads from the environment beyond the worker's settings, checked once.

The variables are those of `API_ENVIRONMENT` in onceflow/runtime/config.py, and ONCEFLOW_SIGNAL_KEY,
which the API shares with the workers (README.md, "Configuration"). A wrong value stops `onceflow
api` with a message that names the variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from onceflow.activities.signal_door import check_key
from onceflow.runtime.config import env
from onceflow.sdk.durations import parse_positive_duration


class TenantLabel(StrEnum):
    """How the queue's gauges on /metrics name a tenant."""

    NAME = "name"  # as it is
    HASH = "hash"  # the first 12 hex digits of its SHA-256: tells tenants apart, names none
    NONE = "none"  # not at all: the figures are summed over tenants


@dataclass(frozen=True)
class ApiOptions:
    console_idle: timedelta = timedelta(minutes=30)
    console_lifetime: timedelta = timedelta(hours=12)
    signal_key: str = field(default="", repr=False)  # signs operator assertions; "" makes none
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no /metrics listener
    tenant_label: TenantLabel = TenantLabel.NAME
    forwarded_allow_ips: str = "127.0.0.1,::1"

    @classmethod
    def from_env(cls) -> ApiOptions:
        """Every API variable, checked; ValueError names the one that is wrong."""
        idle = _duration("ONCEFLOW_CONSOLE_IDLE_TIMEOUT")
        lifetime = _duration("ONCEFLOW_CONSOLE_SESSION_LIFETIME")
        key = env("ONCEFLOW_SIGNAL_KEY")
        if key:
            check_key(key)
        port_text = env("ONCEFLOW_API_METRICS_PORT").strip()
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ValueError(f"ONCEFLOW_API_METRICS_PORT must be a port number (0: none), not {port_text!r}")
        label = env("ONCEFLOW_METRICS_TENANT_LABEL").strip().lower()
        if label not in set(TenantLabel):
            raise ValueError(f"ONCEFLOW_METRICS_TENANT_LABEL must be name, hash or none, not {label!r}")
        return cls(
            console_idle=idle,
            console_lifetime=lifetime,
            signal_key=key,
            metrics_host=env("ONCEFLOW_API_METRICS_HOST"),
            metrics_port=int(port_text),
            tenant_label=TenantLabel(label),
            forwarded_allow_ips=env("ONCEFLOW_FORWARDED_ALLOW_IPS"),
        )


def _duration(name: str) -> timedelta:
    text = env(name)
    try:
        return parse_positive_duration(text)
    except ValueError:
        raise ValueError(f"{name} must be a duration above zero such as 30m or 12h, not {text!r}") from None
