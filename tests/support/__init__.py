"""Helpers the tests share: the checkout's paths here, the rest by purpose in the modules beside."""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
