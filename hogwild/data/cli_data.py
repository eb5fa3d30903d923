"""The ``hogwild data`` commands: ``ingest``, ``preview``, ``info``, ``verify`` and ``serve``.

:mod:`hogwild.cli_parser` adds them with :func:`add_data_commands` and :mod:`hogwild.cli` runs them
with :func:`run_data_command` (``serve`` through its ``run`` default, which takes the
``--section.key=value`` overrides); user errors are raised as :class:`~hogwild.errors.DataError` for
the CLI's usual one-line message and exit status 2.

::

    hogwild data ingest SRC --out CACHE [--size 256] [--channels 3] [--workers N] [--chunk 1024]
    hogwild data preview CACHE --out grid.png [--n 64] [--seed S] [--augment SPEC]
                         [--epoch E] [--variants K] [--split train]
    hogwild data info CACHE [--json]
    hogwild data verify CACHE [--split NAME]
    hogwild data serve [SOURCE] [--config JOB.toml] [--bind HOST] [--port P] [--keys DIR]
                       [--threads T] [--keep K] [--section.key=value ...]

``serve`` is Adam's data server (:mod:`hogwild.data.server`): it holds SOURCE (default
``data.source``) in memory within ``data.ram_budget_mb``, renders ``data.augment`` with
``train.seed`` ahead of demand, and serves batches until SIGTERM or Ctrl-C (exit 143 or 0). Once
it accepts requests it prints one line to stderr, ``hogwild data: serving SOURCE (N train, M test
examples) on HOST:PORT``, for launchers and tests to wait for.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

DEFAULT_PORT = 5580
_INGEST_HELP = (
    "Build an LMDB image cache from MNIST/Fashion-MNIST idx files, CIFAR-10 binary batches, or "
    "a folder with one subfolder of images per class (optionally train/ and test/ folders laid "
    "out that way). An interrupted ingest resumes when run again with the same arguments."
)


def _augment_spec(text: str):
    from hogwild.data.augment import AugmentSpec

    try:
        return AugmentSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_data_commands(subparsers) -> argparse.ArgumentParser:
    """Add ``data`` and its subcommands to the CLI's subparsers; returns the ``data`` parser."""
    from hogwild.data.sources import IMAGE_FORMATS

    data = subparsers.add_parser("data", help="build, inspect and preview LMDB image caches")
    sub = data.add_subparsers(dest="data_command", required=True)

    ingest = sub.add_parser("ingest", help="build an LMDB image cache", description=_INGEST_HELP)
    ingest.add_argument("src", help="idx directory or file, CIFAR-10 batches, or image folders")
    ingest.add_argument("--out", required=True, help="the cache directory to create or finish")
    ingest.add_argument(
        "--size", type=int, default=256, help="side of square images from folders (default 256)"
    )
    ingest.add_argument(
        "--channels", type=int, choices=(1, 3), default=3, help="3 = RGB, 1 = grey (folders)"
    )
    ingest.add_argument(
        "--workers", type=int, help="decoding processes for image folders (default: cores)"
    )
    ingest.add_argument("--chunk", type=int, default=1024, help="records per transaction")
    ingest.add_argument(
        "--formats",
        default=",".join(IMAGE_FORMATS),
        help="image folders: the Pillow formats to decode, comma-separated, or 'all' "
        f"(default {','.join(IMAGE_FORMATS)})",
    )
    ingest.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="image folders: take files and folders linked from outside the source",
    )
    ingest.add_argument("--no-progress", action="store_true", help="no progress bar")
    ingest.add_argument("--json", action="store_true", help="print one JSON line at the end")

    preview = sub.add_parser("preview", help="draw a PNG grid of augmented samples")
    preview.add_argument("cache", help="the cache directory")
    preview.add_argument("--out", required=True, help="the PNG file to write")
    preview.add_argument("--n", type=int, default=64, help="images to show (default 64)")
    preview.add_argument("--seed", type=int, default=0, help="which images, which variants")
    preview.add_argument(
        "--augment",
        type=_augment_spec,
        default="none",  # argparse applies type= to a string default, lazily
        help="e.g. 'translate=0.1,hflip,rotate=15,scale=0.9:1.1,crop=24' or a preset "
        "(none, mnist, cifar, imagenet); default none",
    )
    preview.add_argument("--epoch", type=int, default=0, help="the epoch whose variants to show")
    preview.add_argument(
        "--variants", type=int, default=1, help="K > 1: one row per image, original + K epochs"
    )
    preview.add_argument("--split", default="train", help="the split to sample (default train)")

    info = sub.add_parser("info", help="print a cache's manifest")
    info.add_argument("cache", help="the cache directory")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")

    verify = sub.add_parser("verify", help="check every record's checksum")
    verify.add_argument("cache", help="the cache directory")
    verify.add_argument("--split", help="only this split (default: all)")

    serve = sub.add_parser(
        "serve",
        help="serve a data set to training replicas (Adam's data server)",
        description="Hold a data set in memory, render its augmented variants ahead of demand "
        "and serve batches over the network until SIGTERM or Ctrl-C. Any config key can be set "
        "as --section.key=value (data.augment, train.seed, data.ram_budget_mb).",
    )
    serve.add_argument(
        "source", nargs="?", help="idx directory, LMDB image cache or 'mnist' (default data.source)"
    )
    serve.add_argument("--config", help="the job's TOML config (default: the bundled one)")
    serve.add_argument("--bind", default=None, help="host to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--keys", help="CURVE key directory (required beyond loopback; ps.keys)")
    serve.add_argument("--threads", type=int, default=2, help="serve threads (default 2)")
    serve.add_argument("--keep", type=int, default=3, help="rendered epochs held (default 3)")
    serve.set_defaults(run=_serve, overrides_ok=True)
    return data


def run_data_command(args: argparse.Namespace) -> int:
    """Run a parsed ``hogwild data ...`` command; returns the exit status.

    Raises:
        DataError: A user error (bad source, corrupt or foreign cache...), naming the input.
    """
    command = args.data_command
    if command == "ingest":
        return _ingest(args)
    if command == "preview":
        return _preview(args)
    if command == "info":
        return _info(args)
    if command == "verify":
        return _verify(args)
    if command == "serve":
        return _serve(args)
    raise ValueError(f"unknown data command {command!r}")


def _ingest(args) -> int:
    from hogwild.data.ingest import ingest

    report = ingest(
        args.src,
        args.out,
        size=args.size,
        channels=args.channels,
        workers=args.workers,
        chunk=args.chunk,
        progress=not args.no_progress,
        formats=args.formats,
        follow_symlinks=args.follow_symlinks,
    )
    manifest = report.manifest
    if args.json:
        doc = {
            "cache": str(report.path),
            "count": manifest.count,
            "splits": {name: info.count for name, info in manifest.splits.items()},
            "shape": list(manifest.shape),
            "written": report.written,
            "resumed": report.resumed,
            "skipped": len(report.skipped),
            "already_complete": report.already_complete,
        }
        print(json.dumps(doc))
        return 0
    shape = "x".join(str(v) for v in manifest.shape)
    splits = ", ".join(f"{info.count:,} {name}" for name, info in manifest.splits.items())
    if report.already_complete:
        print(f"{report.path}: already complete ({splits} images of {shape})")
    else:
        resumed = sum(report.resumed.values())
        note = f", resumed after {resumed:,} already written" if resumed else ""
        print(f"{report.path}: {splits} images of {shape}, {len(manifest.classes)} classes{note}")
    if report.skipped:
        print(
            f"skipped {len(report.skipped)} unreadable image(s), listed in "
            f"{report.path / 'skipped.txt'}:",
            file=sys.stderr,
        )
        for split, file, reason in report.skipped[:10]:
            print(f"  {split}: {file}: {reason}", file=sys.stderr)
        if len(report.skipped) > 10:
            print(f"  ... and {len(report.skipped) - 10} more", file=sys.stderr)
    return 0


def _preview(args) -> int:
    from hogwild.data.preview import preview
    from hogwild.outputs import writable_file

    writable_file(args.out, "preview image (--out)")  # before the images are rendered
    path = preview(
        args.cache,
        args.out,
        n=args.n,
        seed=args.seed,
        spec=args.augment,
        epoch=args.epoch,
        variants=args.variants,
        split=args.split,
    )
    print(f"wrote {path}")
    return 0


def _info(args) -> int:
    from hogwild.data.layout import read_manifest

    manifest = read_manifest(args.cache)
    if args.json:
        print(json.dumps(json.loads(manifest.to_json())))
        return 0
    print(
        f"{args.cache}: hogwild image cache v{manifest.version}, records v{manifest.record_version}"
    )
    print(
        f"  shape {list(manifest.shape)}, {len(manifest.classes)} classes, made {manifest.created}"
    )
    for name, info in manifest.splits.items():
        skipped = f", {info.skipped} skipped at ingest" if info.skipped else ""
        print(f"  {name}: {info.count:,} records{skipped}, {info.checksum}")
    return 0


def _verify(args) -> int:
    from hogwild.data.cache import open_cache, read_manifest

    manifest = read_manifest(args.cache)
    for split in [args.split] if args.split else list(manifest.splits):
        with open_cache(args.cache, split) as cache:
            cache.verify()
        print(f"{args.cache}: {split}: {manifest.splits[split].count:,} records verified")
    return 0


def _serve(args) -> int:
    from hogwild.config import load_config
    from hogwild.data.augment import AugmentSpec
    from hogwild.data.resident import Delivery, load_source
    from hogwild.data.server import DataServer
    from hogwild.errors import HogwildError
    from hogwild.net.address import LOOPBACK, check_bind, host_port, parse_address
    from hogwild.net.metrics import serve_metrics
    from hogwild.signals import StopRequest

    config = load_config(args.config, getattr(args, "overrides", None) or None)
    if args.threads < 1 or args.keep < 0:
        raise HogwildError(f"--threads {args.threads} / --keep {args.keep}: need >= 1 / >= 0")
    host = args.bind or LOOPBACK
    port = DEFAULT_PORT if args.port is None else args.port
    address = parse_address(host_port(host, port))
    keys = args.keys or config.ps.keys or None
    check_bind(address, keys)  # before the data is loaded
    text = config.data.augment.strip()
    spec = AugmentSpec.parse(text) if text else None
    budget = config.data.ram_budget_mb * 2**20 or None
    source = load_source(args.source or config.data.source, budget)
    try:  # the server owns the source once it exists (its stop closes it)
        delivery = Delivery(source, augment=spec, seed=config.train.seed, keep=args.keep,
                            ram_budget_bytes=budget)  # fmt: skip
        server = DataServer(delivery, address, keys=keys, threads=args.threads)
    except BaseException:
        source.close()
        raise
    with StopRequest() as stop:
        endpoint = None
        try:
            bound = server.start()
            endpoint = serve_metrics("data", str(bound), config.cluster.metrics_port, server.status)
            print(
                f"hogwild data: serving {source.path} ({source.count('train')} train, "
                f"{source.count('test')} test examples) on {bound}",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(0.5):
                if not server.alive:
                    raise HogwildError(f"the network thread stopped: {server.router.failure!r}")
        finally:
            if endpoint is not None:
                endpoint.close()
            server.stop()
    print("hogwild data: stopped", file=sys.stderr, flush=True)
    return 143 if signal.SIGTERM in stop.received else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hogwild.data.cli_data ...``: the data commands on their own, as the CLI runs
    them (one-line errors, exit status 2, 130 on Ctrl-C)."""
    from hogwild.errors import HogwildError

    parser = argparse.ArgumentParser(prog="hogwild")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_data_command(args)
    except HogwildError as exc:
        print(f"hogwild: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hogwild: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
