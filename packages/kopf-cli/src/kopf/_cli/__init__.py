"""The kopf command-line tool."""
