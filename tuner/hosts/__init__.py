"""Hosts: where the SGLang server runs. See `base.Host` for the protocol."""

from tuner.hosts.base import CommandResult, Host, ShellHost, quote_argv
from tuner.hosts.local import LocalHost
from tuner.hosts.ssh import SSHHost, SSHOptions

__all__ = ["CommandResult", "Host", "LocalHost", "SSHHost", "SSHOptions", "ShellHost", "quote_argv"]
