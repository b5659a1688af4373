"""The rooms of the house: each folder and the package it installs as."""

from __future__ import annotations

# folder -> the package it installs as
PACKAGES = {
    "brimful": "brimful",
    "api": "brimful.api",
    "batcher": "brimful.batcher",
    "workers": "brimful.workers",
    "model_server": "brimful.model_server",
    "core": "brimful.core",
    "schemas": "brimful.schemas",
    "client": "brimful_client",
}
