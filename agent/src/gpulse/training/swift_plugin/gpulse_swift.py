"""ms-swift external plugin: ``--external_plugins <this file> --callbacks gpulse``.

It lives alone in its directory because ms-swift inserts the plugin's directory at the front of
``sys.path``: next to gpulse's other modules it would shadow top-level packages such as
``lightning`` or ``swift`` itself.
"""

from gpulse.training.swift import register

register()
