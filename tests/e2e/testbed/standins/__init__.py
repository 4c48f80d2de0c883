"""TEST FIXTURES ONLY: stand-ins for kubeadm, kubelet, kubectl and crictl, packaged for testbed nodes.

``k8s_standin`` runs on the nodes' Debian python3 with the standard library only, built into one zipapp
that dispatches on the name it is invoked as. None of this is Kubernetes and none of it is ever shipped.
"""
