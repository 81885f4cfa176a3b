"""Python source -> block IR."""
from pcbatch.frontend.converter import convert_function
from pcbatch.frontend.program import build_program

__all__ = ["build_program", "convert_function"]
