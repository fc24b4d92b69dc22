"""The steps most reconcilers take over one client, apart from the client itself.

Finalizers, owner references, create-or-update, merge patch and status conditions: kept out of
``_client`` (talking to one API server) as controller-runtime keeps controllerutil out of client.
"""
