"""Python source -> block IR."""
from pcbatch.frontend.bound import BoundFunction
from pcbatch.frontend.converter import convert_function
from pcbatch.frontend.program import convert_program, form_program

__all__ = ["BoundFunction", "convert_function", "convert_program", "form_program"]
