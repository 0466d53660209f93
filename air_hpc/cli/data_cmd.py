"""``air-hpc data prepare|inspect``: build and describe HDF5 token files."""

from pathlib import Path

import click


@click.group("data")
def data() -> None:
    """Build and inspect HDF5 token files for training."""


@data.command("prepare")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="HDF5 file to write.")
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
def prepare(inputs: tuple[Path, ...], output: Path, project: bool, tokenizer: str) -> None:
    """Tokenize text files (one document each) and JSONL files (one document per line's "text") into OUTPUT."""
    from air_hpc.errors import InputError
    from air_hpc.train.data import load_tokenizer, project_sources
    from air_hpc.train.data import prepare as build

    sources = [*inputs, *(project_sources() if project else [])]
    if not sources:
        raise InputError("data prepare: no INPUT files given (and no --project)")
    info = build(sources, output, load_tokenizer(tokenizer))
    click.echo(
        f"{info.path}: {info.tokens} tokens, {info.documents} documents, "
        f"tokenizer {info.tokenizer} (vocab {info.vocab_size}), dtype {info.dtype}"
    )


@data.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--sample-tokens", default=200, show_default=True, help="Tokens of the corpus start to show.")
def inspect(path: Path, sample_tokens: int) -> None:
    """Print a token file's counts, tokenizer and the start of its text."""
    from air_hpc.train.data import inspect as describe
    from air_hpc.train.data import sample_text

    info = describe(path)
    click.echo(f"file:       {info.path}")
    click.echo(f"tokens:     {info.tokens}")
    click.echo(f"documents:  {info.documents}")
    click.echo(f"tokenizer:  {info.tokenizer} (vocab {info.vocab_size}, eod {info.eod_id})")
    click.echo(f"dtype:      {info.dtype} ({'contiguous' if info.contiguous else 'chunked'})")
    click.echo("sample:")
    click.echo(sample_text(path, sample_tokens))
