"""Root pytest configuration: names every doctest (package and README) can use."""
import pytest
import torch

import nnsparse


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace["torch"] = torch
    doctest_namespace["nnsparse"] = nnsparse
