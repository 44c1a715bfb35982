"""``tvm-nimble serve``: serve an artifact on Ray Serve until Ctrl-C (:mod:`tvm_nimble.serve`).

  tvm-nimble serve model.nimble --replicas 2 --port 8000
  curl -d '{"inputs": {"input": [[[[0.5, ...]]]]}}' http://127.0.0.1:8000/    # -> {"outputs": [...], ...}

Each replica is one process with one executor (one GPU each for a CUDA artifact); requests are gathered
into batches by ``@serve.batch``. Without ``--address`` a Ray cluster starts on this machine.
"""
from __future__ import annotations

import argparse
import time

HELP = "serve an artifact over HTTP on Ray Serve, one replica per GPU (needs the [serve] extra)"
EXAMPLE = "tvm-nimble serve model.nimble --replicas 2 --port 8000"


def register(add) -> None:
    """Add the ``serve`` subcommand through ``main.build_parser``'s ``add``."""
    add_arguments(add("serve", run, HELP, EXAMPLE))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory written by `tvm-nimble compile` (bucketed or not)")
    p.add_argument("--replicas", type=int, default=1, help="Serve replicas (processes; one GPU each on CUDA)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--max-batch-size", type=int, help="most requests in one batch (default: the largest bucket, "
                   "else 8)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="how long a batch waits to fill (default 2)")
    p.add_argument("--address", help="an existing Ray cluster to join (ray.init's address; default: start one here)")


def run(args) -> None:
    from tvm_nimble import serve

    options = serve.ServeOptions(args.artifact, replicas=args.replicas, max_batch_size=args.max_batch_size,
                                 batch_wait_ms=args.batch_wait_ms)
    options.facts()  # a bad artifact path fails in one line before Ray starts
    ray, _ = serve.require_ray()
    ray.init(address=args.address, log_to_driver=False)
    try:
        serve.start(options, host=args.host, port=args.port)
        print(f"serving {args.artifact} with {args.replicas} replica(s) at http://{args.host}:{args.port}"
              f"{options.route_prefix} (POST {{\"inputs\": {{name: nested list}}}}); Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("tvm-nimble: stopping", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
