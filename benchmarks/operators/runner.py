"""
Run an operator file with `kopf.run()`: the same script works for Kopf and for this project.

Usage: python runner.py OPERATOR_FILE  (KUBECONFIG must point to the cluster or the emulator).
"""
import runpy
import sys

import kopf

runpy.run_path(sys.argv[1])
kopf.run(standalone=True, namespaces=['default'])
