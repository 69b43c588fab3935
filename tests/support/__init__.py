"""Helpers shared by the tests (not tests themselves): waiting, references data, launchers."""
