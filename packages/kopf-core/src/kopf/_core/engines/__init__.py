"""
The engines: specialised aspects of a running operator, each usually a background task or two
that the reactor starts and stops (e.g. posting the Kubernetes events in the background).

Engines use the actions and intents below them, and never import the reactor above them.
"""
