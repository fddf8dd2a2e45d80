"""Whole models built from tfm_course.layers: ``from tfm_course.models import transformer``."""
