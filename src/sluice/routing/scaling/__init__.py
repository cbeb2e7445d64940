"""The autoscaling policy, its observation of the fleet, the scaling signal, and its KEDA form."""
