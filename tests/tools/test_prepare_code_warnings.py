"""Parsing model code to decide on auto-print must not print the model's SyntaxWarnings into tirl's own output."""

import warnings

from tirl.tools.code_interpreter import prepare_code


def test_prepare_code_keeps_syntax_warnings_of_model_code_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning escaping prepare_code fails the test
        assert prepare_code("[0x1for x in (1, 2)]", auto_print=True) == "print([0x1for x in (1, 2)])"
