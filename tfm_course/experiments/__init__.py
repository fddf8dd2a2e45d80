"""Lab equipment: what runs experiments, kept apart from the ideas.

Timing and memory helpers, the quality / recall / generation benches, the
harness that compares the three pre-training objectives, and the stored-run
writer and reader. The core modules (attention, positional, layers, models,
efficient, tokenizers, data, decoding, train, ngram) never import this
package; it imports them.

Import the module you need, e.g. ``from tfm_course.experiments.timing import
time_forward``; this file re-exports nothing, so importing it stays cheap.
"""
