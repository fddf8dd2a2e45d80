"""Synthetic tasks and offline text: nothing here downloads anything.

Import the submodule you need, e.g. ``from tfm_course.data import translation``.
"""
