"""What tests in every folder share: waiting on a condition (`polling`)."""
