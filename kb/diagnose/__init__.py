"""Diagnosis: facts from the fact layer + incident triggers + signatures + hybrid retrieval -> ranked diagnoses."""
