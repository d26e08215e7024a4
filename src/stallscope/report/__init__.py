"""Renderers of an analysis: terminal text, Markdown, HTML with plots."""
