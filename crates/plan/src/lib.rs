//! lab-plan
