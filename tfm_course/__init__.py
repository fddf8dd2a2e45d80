"""tfm_course: the companion package of tfm-course, an executable course on Transformers.

One module per idea; open any of them and read it top to bottom.
"""

__version__ = "0.1.0"
