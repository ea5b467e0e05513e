"""Helpers the tests share (fixtures' building blocks); no tests here."""
