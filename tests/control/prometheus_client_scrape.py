#!/usr/bin/env python3
"""Scrapes a /metrics URL and prints, as JSON, what the Prometheus Python client's parser read from it.

tests/control/metrics_http_test.cpp runs it against a live coordinator, so the exposition text is
judged by a parser deepen did not write (prometheus_client, pinned in requirements.txt), fetched by an
HTTP client deepen did not write (urllib). Values are printed with repr() so NaN and Inf survive JSON.
"""
import argparse
import json
import sys
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit("prometheus_client is not installed: pip install -r requirements.txt (or run scripts/setup.sh)")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="e.g. http://127.0.0.1:9400/metrics")
    args = ap.parse_args()
    with urllib.request.urlopen(args.url, timeout=10) as response:
        status = response.status
        content_type = response.headers.get("Content-Type", "")
        text = response.read().decode("utf-8")
    families = [{"name": f.name, "type": f.type, "help": f.documentation,
                 "samples": [{"name": s.name, "labels": s.labels, "value": repr(s.value)} for s in f.samples]}
                for f in text_string_to_metric_families(text)]
    json.dump({"status": status, "content_type": content_type, "families": families}, sys.stdout)


if __name__ == "__main__":
    main()
