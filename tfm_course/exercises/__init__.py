"""Exercise checkers, one module per chapter: ``from tfm_course.exercises import ch01``.

Every checker takes *your* function, runs it on several cases, prints what is right or wrong in
words, and returns True or False. It never raises because of your answer: an unfinished stub that
raises ``NotImplementedError`` is reported as "not attempted yet".
"""
