"""RidgeFill inside SGLang's scheduler process: request plans, the two-sweep prefill, the maps in memory."""
