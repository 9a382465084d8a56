"""Holds only the ms-swift plugin file: ms-swift puts the plugin's directory first on ``sys.path``."""
