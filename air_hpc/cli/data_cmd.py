"""``air-hpc data prepare|inspect``: build token files, describe shards and blends."""

from pathlib import Path
from typing import Any

import click

from air_hpc.cli.options import echo_json, json_option, set_option


@click.group("data")
def data() -> None:
    """Build and inspect HDF5 token files for training."""


@data.command("prepare")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="HDF5 file, or with --shard-tokens a directory.",
)
@click.option(
    "--project",
    is_flag=True,
    help="Add this project's README and Python sources (the demo corpus; configs use runs/data/corpus.h5).",
)
@click.option(
    "--tokenizer",
    default="byte",
    show_default=True,
    help="'byte' (offline, vocab 257) or a local Hugging Face tokenizer directory / tokenizer.json.",
)
@click.option(
    "--shard-tokens",
    type=click.IntRange(min=1),
    help="Write OUTPUT/part-GGGGG-KKKK.h5 shards of about this many tokens (cut at document ends), one process "
    "per input group.",
)
@click.option("--workers", type=click.IntRange(min=1), help="Processes for --shard-tokens (default: every core).")
@click.option(
    "--group-mb",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Input text per group (consecutive inputs); the output depends on it, not on --workers.",
)
def prepare(
    inputs: tuple[Path, ...],
    output: Path,
    project: bool,
    tokenizer: str,
    shard_tokens: int | None,
    workers: int | None,
    group_mb: int,
) -> None:
    """Tokenize text files (one document each) and JSONL files (one document per line's "text") into OUTPUT."""
    from air_hpc.errors import InputError
    from air_hpc.train.data import load_tokenizer, project_sources
    from air_hpc.train.data import prepare as build

    sources = [*inputs, *(project_sources() if project else [])]
    if not sources:
        raise InputError("data prepare: no INPUT files given (and no --project)")
    if shard_tokens is not None:
        _prepare_sharded(sources, output, tokenizer, shard_tokens, workers, group_mb << 20)
        return
    if workers is not None:
        raise InputError("data prepare: --workers needs --shard-tokens (one output file is written by one process)")
    info = build(sources, output, load_tokenizer(tokenizer))
    click.echo(
        f"{info.path}: {info.tokens} tokens, {info.documents} documents, "
        f"tokenizer {info.tokenizer} (vocab {info.vocab_size}), dtype {info.dtype}"
    )


def _prepare_sharded(
    sources: list[Path], output: Path, tokenizer: str, shard_tokens: int, workers: int | None, group_bytes: int
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from air_hpc.train.prepare import prepare_sharded

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    console = Console(stderr=True)  # stdout keeps the one summary line
    with Progress("[progress.description]{task.description}", *columns, transient=True, console=console) as bar:
        task = bar.add_task("tokenizing", total=None)
        infos = prepare_sharded(
            sources,
            output,
            tokenizer,
            shard_tokens,
            workers,
            group_bytes,
            on_progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    tokens, documents = sum(i.tokens for i in infos), sum(i.documents for i in infos)
    click.echo(f"{output}: {len(infos)} shards, {tokens} tokens, {documents} documents")


@data.command("inspect")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--job", "job_file", help="Describe a job's data (its data.path or data.blend) instead of PATH.")
@set_option
@click.option(
    "--steps", type=click.IntRange(min=0), help="Steps for the epochs column (default: the job's train.steps)."
)
@click.option("--sample-tokens", default=200, show_default=True, help="Tokens of the corpus start to show (one file).")
@json_option
def inspect(
    path: Path | None,
    job_file: str | None,
    overrides: tuple[str, ...],
    steps: int | None,
    sample_tokens: int,
    as_json: bool,
) -> None:
    """Describe PATH (an HDF5 token file, a Megatron .bin/.idx prefix, a directory or a glob of shards)
    or, with --job, a job's blend: sources, shards, tokens, documents, samples and the epochs of each
    source that --steps steps make."""
    from air_hpc.config import load_job
    from air_hpc.config.models import DataConfig
    from air_hpc.data.blend import plan, report
    from air_hpc.errors import InputError

    if (path is None) == (job_file is None):
        raise InputError("data inspect: give a PATH or --job JOB_FILE (one of them)")
    if job_file is not None:
        job = load_job(job_file, overrides)
        found = plan(job.data, job.model.seq_len)
        total = (job.train.steps if steps is None else steps) * job.train.global_batch_size
    else:
        if path is not None and path.suffix in (".h5", ".hdf5") and path.is_file() and not as_json:
            _describe_file(path, sample_tokens)
            return
        found = plan(DataConfig(path=path), seq_len=1)
        total = 0
    described = report(found, total)
    if as_json:
        echo_json(described)
    else:
        _print_report(described)


def _describe_file(path: Path, sample_tokens: int) -> None:
    from air_hpc.data.hdf5 import inspect as describe
    from air_hpc.train.data import sample_text

    info = describe(path)
    click.echo(f"file:       {info.path}")
    click.echo(f"tokens:     {info.tokens}")
    click.echo(f"documents:  {info.documents}")
    click.echo(f"tokenizer:  {info.tokenizer} (vocab {info.vocab_size}, eod {info.eod_id})")
    click.echo(f"dtype:      {info.dtype} ({'contiguous' if info.contiguous else 'chunked'})")
    click.echo("sample:")
    click.echo(sample_text(path, sample_tokens))


def _print_report(described: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    blend = described["samples"] > 0
    table = Table(title=f"{described['samples']} samples of seq_len {described['seq_len']}" if blend else None)
    columns = ["source", "path", "weight", "formats", "shards", "tokens", "documents"]
    columns += ["samples", "drawn", "epochs"] if blend else []
    for column in columns:
        table.add_column(column, justify="left" if column in ("source", "path", "formats") else "right")
    for s in described["sources"]:
        row = [s["key"], s["path"], f"{s['weight']:.3f}", ",".join(s["formats"]), str(s["shards"])]
        row += [str(s["tokens"]), str(s["documents"])]
        row += [str(s["samples"]), str(s["drawn"]), f"{s['epochs']:.3f}"] if blend else []
        table.add_row(*row)
    Console(width=max(120, len(max((s["path"] for s in described["sources"]), key=len)) + 80)).print(table)
    click.echo(f"tokenizer: {described['tokenizer'] or 'not recorded'} (vocab {described['vocab_size'] or '?'})")


@data.command("convert")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", required=True, type=click.Path(path_type=Path), help="HDF5 file, or Megatron prefix to write."
)
@click.option("--tokenizer-name", help="Megatron -> HDF5 without PREFIX.json: the tokenizer that made the tokens.")
@click.option("--vocab-size", type=click.IntRange(min=1), help="... its vocabulary size.")
@click.option("--eod-id", type=click.IntRange(min=0), help="... its end-of-document id.")
def convert(source: Path, output: Path, tokenizer_name: str | None, vocab_size: int | None, eod_id: int | None) -> None:
    """Convert SOURCE between formats, tokens and documents bit for bit: an HDF5 token file (.h5) becomes a
    Megatron corpus OUTPUT.bin/OUTPUT.idx (written by megatron-core's IndexedDatasetBuilder, plus OUTPUT.json
    with the tokenizer); a Megatron corpus (PREFIX, PREFIX.bin or PREFIX.idx) becomes an HDF5 file. A
    directory or glob of shards becomes the same shards in the other format under the directory OUTPUT."""
    from air_hpc.data.convert import Vocabulary, convert_shards, to_hdf5, to_indexed
    from air_hpc.data.shards import HDF5_SUFFIXES, INDEXED_SUFFIXES, expand, is_glob
    from air_hpc.errors import InputError

    given = [v is not None for v in (tokenizer_name, vocab_size, eod_id)]
    if any(given) and not all(given):
        raise InputError("data convert: give --tokenizer-name, --vocab-size and --eod-id together")
    vocab = (
        Vocabulary(tokenizer_name, vocab_size, eod_id) if tokenizer_name and vocab_size and eod_id is not None else None
    )
    if is_glob(source) or source.is_dir():
        written = convert_shards(expand(source, "data convert"), output, vocab)
        click.echo(f"{output}: {len(written)} shards converted")
        return
    if source.suffix in HDF5_SUFFIXES:
        if any(given):
            raise InputError("data convert: an HDF5 file records its tokenizer; --tokenizer-name and co. are for .idx")
        prefix = to_indexed(source, output.with_suffix("") if output.suffix in INDEXED_SUFFIXES else output)
        click.echo(f"{prefix}.bin, {prefix}.idx, {prefix}.json")
        return
    prefix = source.with_suffix("") if source.suffix in INDEXED_SUFFIXES else source
    click.echo(str(to_hdf5(prefix, output, vocab)))
