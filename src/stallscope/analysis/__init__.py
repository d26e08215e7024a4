"""Stall analysis: profiles and run directories in, diagnoses and advice out."""
