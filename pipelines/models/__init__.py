"""Rankers. Every model has fit/predict with an explicit seed and writes the shared prediction schema."""
