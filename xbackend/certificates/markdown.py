"""A determinism certificate's Markdown twin: verdict, properties, hashes, environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xbackend.files.textfmt import inert, with_module
from xbackend.report.markup import only_our_html, strong, table

__all__ = ["certificate_markdown"]


def certificate_markdown(c: Mapping[str, Any]) -> str:
    """A certificate (its JSON body) as Markdown: granted or not, each property with its evidence, the battery
    and the environment."""
    text = only_our_html("\n".join(_markdown(c)))
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def _ms(x: float) -> str:
    return f"{x:.3g}"


def _markdown(c: Mapping[str, Any]) -> list[str]:
    """The certificate's Markdown twin: verdict, properties, hashes, environment, how to check it."""
    return [
        *_md_verdict(c),
        *_md_properties(c),
        *_md_hashes(c),
        *_md_environment(c),
        "## Check it",
        "",
        *_md_check(c),
    ]


def _md_check(c: Mapping[str, Any]) -> list[str]:
    key = (c.get("signature") or {}).get("key_id", "")
    rerun = [
        "It re-runs this battery on the machine it runs on and says whether the outputs match these",
        "hashes bit for bit, and how its environment differs from this one.",
    ]
    if key:
        return [
            f"Signed (in CERT.json, a DSSE envelope) with the key whose id is `{key}`.",
            "`xbackend verify CERT.json --key SIGNER.pub` checks the signature before reading anything",
            "else.",
            *rerun,
        ]
    return [
        "**Unsigned**: anyone could have written or edited CERT.json. `xbackend verify CERT.json",
        "--allow-unsigned` checks it all the same.",
        *rerun,
    ]


def _first_layer(p: Mapping[str, Any]) -> str:
    return (
        with_module(p["first_layer"], {p["first_layer"]: p["first_layer_module"]}) if p["first_layer"] else ""
    )


def _md_verdict(c: Mapping[str, Any]) -> list[str]:
    backend = c["backend"]
    verdict = "GRANTED" if c["granted"] else "REFUSED"
    out = [
        f"# Determinism certificate: {inert(c['model']['name'])} on {inert(backend['name'])}",
        "",
        f"**{verdict}**",
        "",
    ]
    if backend["status"] != "ok":
        out += [f"{backend['name']} {backend['status']}: {backend['reason']}", ""]
    for p in c["properties"]:
        if p["status"] == "broken":
            first = _first_layer(p)
            out.append(
                f"- BROKEN: {p['name']}: {p['evidence']}" + (f"; first broke at {first}" if first else "")
            )
    bat = c["battery"]
    timed = f" (and {bat['timed_runs']} timed runs)" if bat.get("timed_runs") else ""
    lat = c.get("latency")
    cost = (
        [
            f"Latency of the certified configuration on this machine: median {_ms(lat['median_ms'])} ms "
            f"(min {_ms(lat['min_ms'])}, max {_ms(lat['max_ms'])}) over {lat['runs']} of the certified "
            "runs (each build's first run left out as warm-up).",
            "",
        ]
        if lat
        else []
    )
    return [
        *out,
        "",
        f"Battery: {bat['runs']} runs{timed} in each of {bat['builds']} fresh builds; the first sample alone "
        f"vs in a batch of {bat['batch']}; 1 thread vs the runner's other thread counts.",
        "",
        *cost,
    ]


def _md_properties(c: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            p["name"],
            p["meaning"],
            strong("broken") if p["status"] == "broken" else p["status"],
            p["evidence"],
            _first_layer(p) or "–",
            "yes" if p["promised_by_runner"] else "no",
        ]
        for p in c["properties"]
    ]
    header = ["property", "meaning", "status", "evidence", "first layer that broke", "promised by the runner"]
    return ["## Properties", "", *table(header, rows), ""]


def _md_hashes(c: Mapping[str, Any]) -> list[str]:
    rows = [
        [f"model {c['model']['name']}", c["model"]["sha256"]],
        [f"inputs ({c['inputs']['source']})", c["inputs"]["sha256"]],
        ["outputs (all)", c["outputs"]["sha256"] or "–"],
        *[[f"output {key}", value] for key, value in c["outputs"]["tensors"].items()],
        ["environment", c["environment_sha256"]],
    ]
    return ["## Hashes", "", *table(["what", "sha256"], rows), ""]


def _md_environment(c: Mapping[str, Any]) -> list[str]:
    rows = [
        *([key, value] for key, value in sorted(c["environment"].items())),
        *([f"runner.{key}", value] for key, value in sorted(c["backend"]["info"].items())),
    ]
    return ["## Environment", "", *table(["key", "value"], rows), ""]
