"""Learning the user's taste: style feedback and A/B picks, the pairwise taste model, which version serves a
user, and which variations an A/B test shows."""
